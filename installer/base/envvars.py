"""The environment the installer reads (docs/contract.md §3), as one table.

The CLI's options name these (a test holds the two equal), the manifests may set only
these (plus the proxy and CA variables ``requests`` reads), and the README lists them.
"""

from __future__ import annotations

# Read by no option: the retry policy's own knobs (settings.retry_env).
ENV_RETRIES = "DOWNLOAD_RETRIES"
ENV_TIMEOUT = "DOWNLOAD_TIMEOUT"

INSTALLER_ENV_VARS: tuple[str, ...] = (
    "ROOT_MOUNT_DIR",
    "NVIDIA_INSTALL_DIR_HOST",
    "NVIDIA_INSTALL_DIR_CONTAINER",
    "KERNEL_RELEASE",
    "LOG_FORMAT",
    "NVIDIA_DRIVER_VERSION",
    "NVIDIA_DRIVER_DOWNLOAD_URL",
    "NVIDIA_DRIVER_BASE_URL",
    "NVIDIA_DRIVER_BRANCH",
    "NVIDIA_DRIVER_SHA256",
    "COS_DOWNLOAD_GCS",
    "KERNEL_SOURCE_PATH",
    "FORCE_REINSTALL",
    "LOCK_TIMEOUT",
    "ALLOW_INSECURE_HTTP",
    "NVIDIA_MODULE_ARGS",
    "INSTALL_ONLY",
    "WHEN_IN_USE",
    "PRELOAD",
    "COS_TOOLS_DIR_CONTAINER",
    "COS_TOOLS_DIR_HOST",
    "VULKAN_ICD_DIR_CONTAINER",
    "VULKAN_ICD_DIR_HOST",
    "NVIDIA_KERNEL_MODULE_TYPE",
    "NVIDIA_DISPLAY_MODULES",
    "NVIDIA_PERSISTENCE_MODE",
    "NVIDIA_INSTALLER_METRICS_FILE",
    "COS_ARTIFACTS_SHA256",
    "DOWNLOAD_DEADLINE",
    "DOWNLOAD_MIN_RATE",
    "DOWNLOAD_MIN_RATE_TIME",
    "NVIDIA_PREBUILT_URL",
    "NVIDIA_PREBUILT_SHA256",
    "NVIDIA_PREBUILT_ONLY",
    "NVIDIA_SKIP_CUDA_CHECK",
    "NVIDIA_CC_SET_READY",
    "NVIDIA_CUDA_CHECK_DEADLINE",
    "NVIDIA_FABRIC_DEADLINE",
    "NVIDIA_FABRIC_MANAGER_BASE_URL",
    "NVIDIA_FABRIC_MANAGER_SHA256",
    "NVIDIA_REQUIRED_DAEMONS",
    "NVIDIA_DRY_RUN_GPU_MODEL",  # a preview only: refused without --dry-run
    ENV_RETRIES,
    ENV_TIMEOUT,
)

# Read by ``requests`` rather than by our options (docs/contract.md §3:
# downloads honour proxies and REQUESTS_CA_BUNDLE / SSL_CERT_FILE).
PASSTHROUGH_ENV_VARS: tuple[str, ...] = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
)
