// SPDX-License-Identifier: GPL-2.0
/*
 * Fake nvidia.ko: module parameters, a version, symbols the other modules
 * link against, and a character device (major 195 like NVIDIA's) whose open
 * file holds a reference on the module.
 *
 * Its parameters are where NVIDIA's are: not in sysfs (nv-linux.h,
 * NV_MODULE_PARAMETER(x) is module_param(x, int, 0), NV_MODULE_STRING_PARAMETER
 * module_param(x, charp, 0)) but in /proc/driver/nvidia/params, one "Name: value"
 * line each, NVreg_ dropped, numbers as %u and strings quoted (nv-procfs.c,
 * nv_procfs_read_params), as the real H100 node shows (tests/data/gpu-node).
 */
#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include "nv-fake.h"
#include "nv-version.h"

#define NV_MAJOR 195

static char *NVreg_Test = "unset";
module_param(NVreg_Test, charp, 0);
MODULE_PARM_DESC(NVreg_Test, "test parameter, echoed at load time");

static int NVreg_DeviceFileMode = 0666;
module_param(NVreg_DeviceFileMode, int, 0);
MODULE_PARM_DESC(NVreg_DeviceFileMode, "mode of the device files nvidia-modprobe makes");

static atomic_t nv_clients = ATOMIC_INIT(0);
static int nv_major;
static struct proc_dir_entry *nv_proc_dir;

static int nv_read_params(struct seq_file *s, void *v)
{
	seq_printf(s, "DeviceFileMode: %u\n", (unsigned int)NVreg_DeviceFileMode);
	seq_printf(s, "Test: \"%s\"\n", NVreg_Test ? NVreg_Test : "");
	return 0;
}

int nvidia_register_client(const char *name)
{
	atomic_inc(&nv_clients);
	pr_info("NVRM: client %s registered\n", name);
	return 0;
}
EXPORT_SYMBOL(nvidia_register_client);

void nvidia_unregister_client(const char *name)
{
	atomic_dec(&nv_clients);
	pr_info("NVRM: client %s unregistered\n", name);
}
EXPORT_SYMBOL(nvidia_unregister_client);

const char *nvidia_get_version(void)
{
	return NV_VERSION_STRING;
}
EXPORT_SYMBOL(nvidia_get_version);

static int nv_open(struct inode *inode, struct file *file)
{
	return 0;
}

static int nv_release(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.release = nv_release,
	.llseek = noop_llseek,
};

static int __init nvidia_init(void)
{
	int rc = register_chrdev(NV_MAJOR, "nvidia-frontend", &nv_fops);

	if (rc < 0) {
		pr_err("NVRM: cannot register major %d: %d\n", NV_MAJOR, rc);
		return rc;
	}
	nv_major = NV_MAJOR;
	nv_proc_dir = proc_mkdir("driver/nvidia", NULL);
	if (nv_proc_dir)
		proc_create_single("params", 0444, nv_proc_dir, nv_read_params);
	pr_info("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  %s (fake) NVreg_Test=%s\n",
		NV_VERSION_STRING, NVreg_Test);
	return 0;
}

static void __exit nvidia_exit(void)
{
	proc_remove(nv_proc_dir);
	unregister_chrdev(nv_major, "nvidia-frontend");
	pr_info("NVRM: unloading NVIDIA Kernel Module %s (fake)\n", NV_VERSION_STRING);
}

module_init(nvidia_init);
module_exit(nvidia_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("fake NVIDIA driver for tests");
MODULE_VERSION(NV_VERSION_STRING);
