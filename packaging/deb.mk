# make deb: dist/compat-hook_<version>_all.deb for Debian's own Python (included by the Makefile).
#   make deb                  build it (needs dpkg-deb; nothing is fetched; no Go)
#   make deb DEB_OUT=DIR      put the .deb into DIR instead of dist/
#   make deb NRI_PLUGIN=BIN   ship the built NRI plugin too (make nri-plugin's dist/compat-hook-nri) as
#                             /usr/libexec/compat-hook/compat-hook-nri: dist/compat-hook_<version>_<arch>.deb
#   make deb-lint             build it and run lintian on it
# Install it with: apt install ./dist/compat-hook_<version>_all.deb
PY ?= /usr/bin/python3
DEB_OUT ?= dist
NRI_PLUGIN ?=

.PHONY: deb deb-lint

deb:
	$(PY) packaging/debian/build-deb.py --out $(DEB_OUT) $(if $(NRI_PLUGIN),--nri-plugin $(NRI_PLUGIN))

deb-lint: deb
	lintian --fail-on error $(DEB_OUT)/compat-hook_*.deb
