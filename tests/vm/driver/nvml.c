/* Fake libnvidia-ml.so.1: the few NVML entry points nvidia-smi and tests use. */
#include <string.h>

#ifndef NV_VERSION
#define NV_VERSION "0.0.0"
#endif

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
int nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	if (length < strlen(NV_VERSION) + 1)
		return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
	strcpy(version, NV_VERSION);
	return 0;
}
