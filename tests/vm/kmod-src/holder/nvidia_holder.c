// SPDX-License-Identifier: GPL-2.0
/* Holds a reference on nvidia.ko for as long as it is loaded. */
#include <linux/kernel.h>
#include <linux/module.h>

const char *nvidia_get_version(void);

static int __init holder_init(void)
{
	pr_info("nvidia_holder: holding nvidia %s\n", nvidia_get_version());
	return 0;
}

static void __exit holder_exit(void)
{
	pr_info("nvidia_holder: released nvidia\n");
}

module_init(holder_init);
module_exit(holder_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("test module that keeps nvidia.ko in use");
