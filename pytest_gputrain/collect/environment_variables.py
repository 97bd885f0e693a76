"""The environment variables that change how GPU training behaves, and nothing else's values.

Reports, facts files and the terminal header are pasted into CI logs and issues, so values are
kept by an allow-list: a variable is *read* only when its name has a prefix of the GPU stack
(``CUDA_``, ``NCCL_``, ``TORCH_``, ``PYTORCH_``, torch.compile's ``TORCHINDUCTOR_`` and
``TORCHDYNAMO_``), and its *value* is kept only when its name is
one of the settings below, which tune or debug training and carry no credentials. Any other
variable of those prefixes keeps its name (it may matter that it is set) with the value
``<redacted>``: ``NCCL_IB_Password``, ``NCCL_API_KEY``, a plugin's token, a name nobody has
reviewed yet. A deny-list of secret-looking words cannot know every such name; this list does
not need to.

A value that is kept may still hold a URL with credentials in it (``TORCH_TRACE`` can name a
remote folder, ``https://user:token@host/...``): the user-info part of every URL in a kept
value is replaced (``https://<redacted>@host/...``) by ``without_credentials``.

``relevant_variables`` is the one filter: the collector and the distributed launcher's record
both use it, and ``read_environment`` reads every fact from its result.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from pytest_gputrain.facts import EnvFacts

REDACTED = "<redacted>"

# Names with these prefixes are read; everything else in the environment is never looked at.
READ_PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_")

# Values shown: CUDA runtime and driver settings (CUDA's programming guide, "CUDA Environment
# Variables"), NCCL's documented tuning and debug variables, and torch's allocator, distributed
# and debugging switches.
ALLOWED = frozenset({
    # CUDA
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING",
    "CUDA_MODULE_DATA_LOADING", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_DEVICE_MAX_COPY_CONNECTIONS",
    "CUDA_SCALE_LAUNCH_QUEUES", "CUDA_AUTO_BOOST", "CUDA_CACHE_DISABLE", "CUDA_CACHE_MAXSIZE",
    "CUDA_CACHE_PATH", "CUDA_FORCE_PTX_JIT", "CUDA_DISABLE_PTX_JIT", "CUDA_FORCE_JIT",
    "CUDA_DISABLE_JIT", "CUDA_MANAGED_FORCE_DEVICE_ALLOC", "CUDA_ENABLE_COREDUMP_ON_EXCEPTION",
    "CUDA_ENABLE_CPU_COREDUMP_ON_EXCEPTION", "CUDA_ENABLE_USER_TRIGGERED_COREDUMP",
    "CUDA_COREDUMP_FILE", "CUDA_DEVICE_WAITS_ON_EXCEPTION", "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_LOG_FILE", "CUDA_HOME", "CUDA_PATH",
    "CUDA_VERSION", "CUDA_DRIVER_VERSION",
    # NCCL: debugging
    "NCCL_VERSION", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_DEBUG_TIMESTAMP_LEVELS", "NCCL_WARN_ENABLE_DEBUG_INFO",
    "NCCL_CHECKS_DISABLE", "NCCL_CHECK_POINTERS", "NCCL_SET_THREAD_NAME", "NCCL_RAS_ENABLE",
    "NCCL_RAS_TIMEOUT_FACTOR", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE",
    # NCCL: transports and topology
    "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_P2P_DIRECT_DISABLE", "NCCL_P2P_READ_ENABLE",
    "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_P2P_LL_THRESHOLD", "NCCL_P2P_PXN_LEVEL", "NCCL_PXN_DISABLE",
    "NCCL_SHM_DISABLE", "NCCL_SHM_USE_CUDA_MEMCPY", "NCCL_SHM_MEMCPY_MODE", "NCCL_NVB_DISABLE",
    "NCCL_NVLS_ENABLE", "NCCL_NVLS_NCHANNELS", "NCCL_NVLS_CHUNKSIZE", "NCCL_MNNVL_ENABLE",
    "NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE", "NCCL_DMABUF_ENABLE", "NCCL_TOPO_FILE",
    "NCCL_GRAPH_FILE", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_CROSS_NIC", "NCCL_COLLNET_ENABLE",
    "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_NET_GDR_C2C",
    "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS", "NCCL_NET_DISABLE_INTRA",
    "NCCL_NET_FORCE_FLUSH", "NCCL_NET_OVERHEAD", "NCCL_NET_MERGE_LEVEL",
    "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_FIFO_TC",
    "NCCL_IB_RETURN_ASYNC_EVENTS", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_IB_CUDA_SUPPORT", "NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_IB_ADAPTIVE_ROUTING",
    "NCCL_IB_AR_THRESHOLD", "NCCL_IB_ECE_ENABLE", "NCCL_IB_MERGE_NICS", "NCCL_IB_MERGE_VFS",
    "NCCL_IB_GDR_LEVEL", "NCCL_IB_USE_INLINE",
    # NCCL: algorithms, channels and buffers
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_MAX_P2P_NCHANNELS",
    "NCCL_MIN_P2P_NCHANNELS", "NCCL_CGA_CLUSTER_SIZE", "NCCL_CTA_POLICY", "NCCL_LAUNCH_MODE",
    "NCCL_LL_THRESHOLD", "NCCL_LL128_ENABLE", "NCCL_TREE_THRESHOLD",
    "NCCL_SINGLE_RING_THRESHOLD", "NCCL_NVLSTREE_MAX_CHUNKSIZE", "NCCL_WORK_FIFO_DEPTH",
    "NCCL_GRAPH_REGISTER", "NCCL_LOCAL_REGISTER", "NCCL_LEGACY_CUDA_REGISTER",
    "NCCL_RUNTIME_CONNECT", "NCCL_SET_STACK_SIZE", "NCCL_COMM_BLOCKING",
    "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT",
    # torch: allocator, distributed, debugging
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NO_HIP_MEMORY_CACHING", "TORCH_TRACE", "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    "TORCHDYNAMO_VERBOSE",
    "PYTORCH_NVML_BASED_CUDA_CHECK", "PYTORCH_TUNABLEOP_ENABLED", "PYTORCH_JIT",
    "TORCH_CUDA_ARCH_LIST", "TORCH_USE_CUDA_DSA", "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_CPP_LOG_LEVEL", "TORCH_LOGS", "TORCH_COMPILE_DEBUG", "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_BLAS_PREFER_CUBLASLT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
    "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DESYNC_DEBUG",
    "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
    "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_USE_COMM_NONBLOCKING",
    "TORCH_NCCL_HIGH_PRIORITY", "TORCH_NCCL_ABORT_IN_DESTROY_PG", "TORCH_NCCL_PROPAGATE_ERROR",
    "TORCH_NCCL_RETHROW_CUDA_ERRORS", "TORCH_NCCL_CUDA_EVENT_CACHE",
    "TORCH_NCCL_NAN_CHECK", "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN",
})


# "scheme://" then the user-info: anything up to the last "@" before the host ends (at "/",
# "?", "#" or a space). Anchored on "://", so each match stops at the next URL's "//": linear
# in the value's length.
_USER_INFO = re.compile(r"://[^/?#\s]*@")


def without_credentials(value: str) -> str:
    """``value`` with the user-info of every URL in it (``user:password@``) redacted."""
    if "@" not in value:
        return value
    return _USER_INFO.sub(f"://{REDACTED}@", value)


def relevant_variables(environ: Mapping[str, str],
                       prefixes: tuple[str, ...] = READ_PREFIXES) -> dict[str, str]:
    """The variables whose names start with ``prefixes``, sorted by name: the value of an
    allowed setting without credentials in URLs, any other value as ``<redacted>``."""
    return {name: without_credentials(value) if name in ALLOWED else REDACTED
            for name, value in sorted(environ.items()) if name.startswith(prefixes)}


# torch.compile's debugging switches (troubleshooting docs): debug directories, full traces of
# the model code, disabled caches.
COMPILE_DEBUG = ("TORCH_COMPILE_DEBUG", "TORCH_TRACE", "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
                 "TORCHDYNAMO_VERBOSE", "TORCH_LOGS")
# TORCH_LOGS artifacts that print generated code or whole graphs (or "+" for debug verbosity).
VERBOSE_LOG_ARTIFACTS = ("output_code", "graph_code", "bytecode", "trace_bytecode",
                         "trace_source", "aot_graphs", "aot_joint_graphs", "kernel_code",
                         "schedule")


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "false", "no", "off")


def compile_debug_settings(environ: Mapping[str, str]) -> list[str]:
    """The torch.compile debugging switches that are on, as ``NAME=value``."""
    found = []
    for name in COMPILE_DEBUG:
        value = environ.get(name)
        if value is None:
            continue
        if name == "TORCH_TRACE":
            on = bool(value.strip())  # a directory: set means on
        elif name == "TORCH_LOGS":
            parts = [part.strip() for part in value.split(",")]
            on = any(part.startswith("+") or part.lstrip("+-") in VERBOSE_LOG_ARTIFACTS
                     for part in parts if part and not part.startswith("-"))
        else:
            on = _truthy(value)
        if on:
            found.append(f"{name}={value}")
    return found


def read_environment(environ: Mapping[str, str] | None = None) -> EnvFacts:
    # Every fact is read from the kept values (all of these names are allowed), so that what
    # the reports print has been filtered once.
    variables = relevant_variables(os.environ if environ is None else environ)
    return EnvFacts(
        variables=variables,
        cuda_visible_devices=variables.get("CUDA_VISIBLE_DEVICES"),
        cuda_launch_blocking=variables.get("CUDA_LAUNCH_BLOCKING", "").strip() not in ("", "0"),
        pytorch_cuda_alloc_conf=variables.get("PYTORCH_CUDA_ALLOC_CONF")
        or variables.get("PYTORCH_ALLOC_CONF"),
        nccl_variables={name: value for name, value in variables.items()
                        if name.startswith("NCCL_")},
        cuda_memory_caching_disabled=_truthy(variables.get("PYTORCH_NO_CUDA_MEMORY_CACHING"))
        or _truthy(variables.get("PYTORCH_NO_HIP_MEMORY_CACHING")),
        compile_debug_settings=compile_debug_settings(variables),
    )
