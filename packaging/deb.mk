# make deb: dist/compat-hook_<version>_all.deb for Debian's own Python (included by the Makefile).
#   make deb                  build it (needs dpkg-deb; nothing is fetched)
#   make deb DEB_OUT=DIR      put the .deb into DIR instead of dist/
#   make deb-lint             build it and run lintian on it
# Install it with: apt install ./dist/compat-hook_<version>_all.deb
PY ?= /usr/bin/python3
DEB_OUT ?= dist

.PHONY: deb deb-lint

deb:
	$(PY) packaging/debian/build-deb.py --out $(DEB_OUT)

deb-lint: deb
	lintian --fail-on error $(DEB_OUT)/compat-hook_*_all.deb
