# nvidia-driver-installer: developer entry points.
# The test venv is made from Debian's /usr/bin/python3 (see README: the pod-like
# chroot tests hide /root, where pyenv's python lives).
PYTHON_BASE ?= /usr/bin/python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help install deps deps-tiers test test-vm test-arm64 soak-vm test-gpu demo lint manifests lock images push test-images test-pod bench clean

help:  ## list the targets
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-z][a-z0-9-]*:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	$(PYTHON_BASE) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,lint]'
	touch $@

install: $(VENV)/.installed  ## the Python environment (package + test/lint tools)

deps:  ## Debian packages the tests and the demo need (root)
	bash scripts/install-deps.sh

test: install  ## the default test run (unit + chroot fixture tests), about 18 min alone on 2 cores (30 beside .ci/run's other tiers)
	$(PY) -m pytest tests --ignore=tests/vm --ignore=tests/realparts --ignore=tests/gpu --ignore=tests/arm64 $(PYTEST_ARGS)

demo: install  ## a real install against a built-in fixture node, the way the pod runs it
	$(PY) -m tests.demo

lint: install  ## ruff, mypy (strict, installer/), yamllint, hadolint and the import-layering contracts (pyproject.toml)
	$(VENV)/bin/ruff check installer tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/yamllint -s manifests
	$(VENV)/bin/hadolint --config images/.hadolint.yaml images/cos/Dockerfile images/ubuntu/Dockerfile

manifests: install  ## render the committed manifests from the templates
	$(VENV)/bin/nvidia-driver-installer manifests render --all --output-dir manifests

lock:  ## regenerate images/requirements.lock (hashed Python dependencies of the images)
	bash scripts/lock-image-deps.sh

images: install  ## build both images for amd64 and arm64 (qemu-user-static) with buildah FROM the bases their Dockerfiles name, one manifest list each (NDI_LOCAL_BASE=1: a local debootstrap substitute, for tests)
	bash images/build.sh

REGISTRY ?=
TAG ?=
push:  ## push the built manifest lists (amd64 + arm64) to REGISTRY/nvidia-driver-installer-<flavor>:TAG and print the lists' digests to pin (make push REGISTRY=... [TAG=...])
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=registry.example.com/team [TAG=0.1.0]" >&2; exit 2; }
	@bash images/push.sh "$(REGISTRY)" $(TAG)

# docker-registry: Debian's reference registry (distribution), for the push/pull test;
# qemu-user-static: the arm64 images' RUN steps (and the arm64 base's debootstrap) on amd64.
IMAGE_DEPS := buildah debootstrap docker-registry qemu-user-static
test-images: install  ## build both images for amd64 and arm64 (local substitute base), install from them on fixture nodes, push the manifest lists and pull each architecture back by digest (slow tier, root; see README for times)
	bash scripts/install-deps.sh $(IMAGE_DEPS)
	NDI_IMAGE_TESTS=1 $(PY) -m pytest tests/test_images.py tests/test_push.py $(PYTEST_ARGS)

# podman runs the pods, runc is its runtime (crun refuses hybrid cgroups), catatonit
# makes the pause image, buildah and debootstrap build our images.
POD_DEPS := podman runc catatonit buildah debootstrap
test-pod: install  ## the committed manifests' pods under podman + runc on fixture nodes (slow tier, root, ~6 min fresh, ~1 min after test-images)
	bash scripts/install-deps.sh $(POD_DEPS)
	NDI_POD_TESTS=1 $(PY) -m pytest tests/pod_tier $(PYTEST_ARGS)

# The VM tier's own tests first: their guests boot while NVIDIA's real builds run in the
# background (tests/vm/host_builds.py); tests/realparts then finds those builds cached.
test-vm: install  ## NVIDIA's real 535/470 (6.1) and 550 open+proprietary (6.12) modules built through the installer, loaded in real kernels under qemu (slow tier; see README for times)
	$(PY) -m pytest tests/vm tests/realparts $(PYTEST_ARGS)

SOAK_BOOTS ?= 20
soak-vm: install  ## not CI: boot every guest kernel of the VM tier SOAK_BOOTS times (default 20), count kernel crashes (report: tests/vm/README.md)
	$(PY) -m tests.vm.soak --boots $(SOAK_BOOTS) $(if $(SOAK_REPORT),--report $(SOAK_REPORT))

# Every slow tier's Debian packages in one apt run, before tiers run side by side
# (.ci/run): two apt-get runs at once would fight over the dpkg lock.
VM_DEPS := qemu-system-x86 qemu-utils debootstrap e2fsprogs pahole
deps-tiers:  ## the slow tiers' Debian packages (root), all at once
	bash scripts/install-deps.sh $(sort $(IMAGE_DEPS) $(POD_DEPS) $(VM_DEPS) $(ARM64_DEPS))

# The arm64 tier's cross compiler (about 150 MB with its binutils and libgcc) and
# qemu-system-aarch64 for the boot that loads the cross-built nvidia.ko.
ARM64_DEPS := gcc-aarch64-linux-gnu qemu-system-arm
test-arm64: install  ## NVIDIA's real arm64 535 modules (Debian's open and proprietary sources) built by `bundle build --arch arm64` on this amd64 machine, then installed by the installer in an arm64 kernel under qemu-system-aarch64 up to "No NVIDIA GPU found" (slow tier; skips without gcc-aarch64-linux-gnu)
	timeout 3600 $(PY) -m pytest tests/arm64 $(PYTEST_ARGS)

test-gpu: install  ## on a real NVIDIA GPU node (root): detect, verify, doctor, the device-file step + CUDA as uid 65534, nvidia-smi exit 9/12, dry run, verify timing; READ-ONLY (no module load/unload, no GPU setting; device files only in a private tmpfs /dev); report in NDI_GPU_REPORT_DIR; skips in seconds without a GPU (NDI_GPU_REQUIRED=1: fail)
	$(PY) -m pytest tests/gpu $(PYTEST_ARGS)

bench: install  ## performance figures vs baselines measured in the same run
	$(PY) bench/run_all.py

clean:  ## remove the venv and build leftovers
	rm -rf $(VENV) .pytest_cache .import_linter_cache build *.egg-info
