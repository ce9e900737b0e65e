/*
 * Fake nvidia-smi, linked against libnvidia-ml.so.1 (so the dynamic loader must
 * resolve it: LD_LIBRARY_PATH or the ld cache). Succeeds only when the nvidia
 * module is loaded, /dev/nvidiactl opens (a node for the loaded module), and
 * the library's version is the loaded module's.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int nvmlInit_v2(void);
int nvmlSystemGetDriverVersion(char *version, unsigned int length);
int nvmlDeviceGetCount_v2(unsigned int *count);

static const char *no_driver =
	"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
	"Make sure that the latest NVIDIA driver is installed and running.\n";

int main(int argc, char **argv)
{
	char kver[64] = "", lver[64] = "";
	unsigned int count = 0;
	int query = 0, i, fd;
	FILE *f;

	for (i = 1; i < argc; i++)
		if (strncmp(argv[i], "--query-gpu", 11) == 0)
			query = 1;
	f = fopen("/sys/module/nvidia/version", "r");
	if (!f || !fgets(kver, sizeof(kver), f)) {
		fputs(no_driver, stdout);
		return 9;
	}
	fclose(f);
	kver[strcspn(kver, "\n")] = 0;
	fd = open("/dev/nvidiactl", O_RDWR);
	if (fd < 0) {
		fputs(no_driver, stdout);
		return 9;
	}
	close(fd);
	if (nvmlInit_v2() != 0 || nvmlSystemGetDriverVersion(lver, sizeof(lver)) != 0) {
		puts("Failed to initialize NVML: Unknown Error");
		return 255;
	}
	if (strcmp(kver, lver) != 0) {
		puts("Failed to initialize NVML: Driver/library version mismatch");
		return 18;
	}
	nvmlDeviceGetCount_v2(&count);
	if (query) {
		printf("NVIDIA Fake GPU (qemu), %s, 00000000:00:04.0\n", lver);
		return 0;
	}
	printf("NVIDIA-SMI %s    Driver Version: %s    GPUs: %u (fake)\n", lver, kver, count);
	return 0;
}
