// SPDX-License-Identifier: GPL-2.0
/* Fake nvidia-modeset.ko: needs nvidia's symbols, exports one to nvidia-drm. */
#include <linux/kernel.h>
#include <linux/module.h>
#include "nv-fake.h"
#include "nv-version.h"

int nvKmsKapiGetFunctionsTable(void *table)
{
	return table != NULL;
}
EXPORT_SYMBOL(nvKmsKapiGetFunctionsTable);

static int __init modeset_init(void)
{
	nvidia_register_client("nvidia-modeset");
	pr_info("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  %s (fake)\n",
		nvidia_get_version());
	return 0;
}

static void __exit modeset_exit(void)
{
	nvidia_unregister_client("nvidia-modeset");
}

module_init(modeset_init);
module_exit(modeset_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("fake NVIDIA modeset driver for tests");
MODULE_VERSION(NV_VERSION_STRING);
