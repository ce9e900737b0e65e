// SPDX-License-Identifier: GPL-2.0
/* Fake nvidia-drm.ko: needs nvidia-modeset's symbol and (by default) the in-tree drm's. */
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#ifdef NV_FAKE_DRM_DEP
#include <drm/drm_fourcc.h>
#endif
#include "nv-fake.h"
#include "nv-version.h"

static bool modeset;
module_param(modeset, bool, 0400);
MODULE_PARM_DESC(modeset, "enable atomic kernel modesetting (ignored)");

static int __init nv_drm_init(void)
{
	int have_kapi = nvKmsKapiGetFunctionsTable(&modeset);
#ifdef NV_FAKE_DRM_DEP
	const struct drm_format_info *fmt = drm_format_info(DRM_FORMAT_XRGB8888);

	pr_info("nvidia-drm: [drm] fake driver %s, kapi=%d, XRGB8888 cpp=%d, modeset=%d\n",
		NV_VERSION_STRING, have_kapi, fmt ? fmt->cpp[0] : -1, modeset);
#else
	pr_info("nvidia-drm: fake driver %s, kapi=%d, modeset=%d\n",
		NV_VERSION_STRING, have_kapi, modeset);
#endif
	return 0;
}

static void __exit nv_drm_exit(void)
{
}

module_init(nv_drm_init);
module_exit(nv_drm_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("fake NVIDIA DRM driver for tests");
MODULE_VERSION(NV_VERSION_STRING);
