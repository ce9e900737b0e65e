# Test tier only: NVIDIA's own Makefile, read unchanged, with one more goal. Its
# ``modules`` recipe is "$(MAKE) $(PAHOLE_VARIABLES) $(KBUILD_PARAMS) $@" (kernel/Makefile
# and kernel-open/Makefile of 535.261.03): kbuild with the variables that Makefile derives
# from SYSSRC/SYSOUT (-C <source> M=<tree> KBUILD_OUTPUT=<output> ARCH NV_KERNEL_* ...).
# ``ndi-objects`` runs that same command with kbuild's single-object goals instead of
# ``modules`` (Documentation/kbuild/modules.rst, "Building single files"): conftest, then
# only the objects named in NDI_OBJECTS (tests/realparts/kbuild.py ``cached_objects``).
include Makefile

.PHONY: ndi-objects
ndi-objects:
	$(MAKE) $(PAHOLE_VARIABLES) $(KBUILD_PARAMS) $(NDI_OBJECTS)
