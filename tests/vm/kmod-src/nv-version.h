/* Overwritten with the driver version when a .run is built. */
#define NV_VERSION_STRING "0.0.0"
