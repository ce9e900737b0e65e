/* Symbols the fake NVIDIA modules export to each other. */
#ifndef NV_FAKE_H
#define NV_FAKE_H

/* nvidia.ko */
int nvidia_register_client(const char *name);
void nvidia_unregister_client(const char *name);
const char *nvidia_get_version(void);

/* nvidia-modeset.ko (the real one exports this name to nvidia-drm) */
int nvKmsKapiGetFunctionsTable(void *table);

#endif
