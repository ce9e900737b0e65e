// SPDX-License-Identifier: GPL-2.0
/* Fake nvidia-uvm.ko: needs nvidia's symbols; a dynamic "nvidia-uvm" char device. */
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include "nv-fake.h"
#include "nv-version.h"

static int uvm_major;

#ifdef NV_FAKE_BROKEN_UVM
/* Exported by no nvidia.ko of this test set. */
int nvidia_uvm_api_from_another_version(void);
#endif

static int uvm_open(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open,
	.llseek = noop_llseek,
};

static int __init uvm_init(void)
{
	int rc = register_chrdev(0, "nvidia-uvm", &uvm_fops);

	if (rc < 0)
		return rc;
	uvm_major = rc;
#ifdef NV_FAKE_BROKEN_UVM
	nvidia_uvm_api_from_another_version();
#endif
	nvidia_register_client("nvidia-uvm");
	pr_info("nvidia-uvm: Loaded the UVM driver, major device number %d (nvidia %s)\n",
		uvm_major, nvidia_get_version());
	return 0;
}

static void __exit uvm_exit(void)
{
	nvidia_unregister_client("nvidia-uvm");
	unregister_chrdev(uvm_major, "nvidia-uvm");
}

module_init(uvm_init);
module_exit(uvm_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("fake NVIDIA UVM driver for tests");
MODULE_VERSION(NV_VERSION_STRING);
