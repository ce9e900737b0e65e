/* Fake libcuda.so.1. */
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *v) { *v = 12040; return 0; }
