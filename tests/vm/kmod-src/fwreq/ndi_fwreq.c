// SPDX-License-Identifier: GPL-2.0
/* insmod ndi_fwreq.ko name=nvidia/<V>/gsp_ga10x.bin: 0 if the firmware loader finds it. */
#include <linux/firmware.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/platform_device.h>

static char *name = "nvidia/unset.bin";
module_param(name, charp, 0444);

static int __init fwreq_init(void)
{
	const struct firmware *fw;
	struct platform_device *pdev;
	int err;

	pdev = platform_device_register_simple("ndi_fwreq", -1, NULL, 0);
	if (IS_ERR(pdev))
		return PTR_ERR(pdev);
	/* No user-mode helper fallback: only the direct filesystem lookup nvidia.ko relies on. */
	err = request_firmware_direct(&fw, name, &pdev->dev);
	if (err) {
		pr_info("ndi_fwreq: %s not found (%d)\n", name, err);
	} else {
		pr_info("ndi_fwreq: %s found, %zu bytes\n", name, fw->size);
		release_firmware(fw);
	}
	platform_device_unregister(pdev);
	return err;
}

static void __exit fwreq_exit(void)
{
}

module_init(fwreq_init);
module_exit(fwreq_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("test module: can the firmware loader find a file");
