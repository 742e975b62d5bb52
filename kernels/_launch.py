"""What the persistent kernel families share on the host: how many CTAs to launch (as
many as stay resident) and how far ahead a row kernel prefetches. The arrays themselves
are checked and allocated by runtime/host_arrays.py.
"""

from __future__ import annotations

from ..runtime.host_arrays import is_torch, rows_start_on_16_bytes


def prefetch_distance(x, config) -> int:
    """Rows ahead that a row kernel prefetches into L2 (0 on the emulator: no L2 there).

    About one wave of resident CTAs ahead (SMs x CTAs per SM, from the config's warps):
    the prefetched row is read by a CTA that starts roughly one CTA lifetime later.
    Rows that do not start on 16-byte boundaries are never prefetched: the bulk
    prefetch would fault on them.
    """
    if not rows_start_on_16_bytes(x):
        return 0
    if config.prefetch_rows >= 0:
        return config.prefetch_rows
    if not is_torch(x) or not x.is_cuda:
        return 0
    from ..runtime import driver

    sm_count = driver.device_properties(x.device.index or 0).sm_count  # cached by the driver
    ctas_per_sm = max(1, 2048 // (32 * config.num_warps))
    return sm_count * ctas_per_sm


EMULATED_CTAS = 3  # persistent kernels on the CPU emulator: a few CTAs, each with several items
_RESIDENT: dict = {}


def persistent_grid(kernel, x, items: int, args: tuple, constexprs: dict, num_warps: int,
                    options: dict | None = None) -> int:
    """CTAs to launch for a persistent kernel over `items` work items (rows, tiles) on
    x's device: as many as the SMs hold at once (every CTA resident, so none waits for
    another to finish; the driver's occupancy answer for a launch with these launch
    `options`, e.g. maxnreg), but no more than there are items."""
    if not (is_torch(x) and x.is_cuda):
        return max(1, min(items, EMULATED_CTAS))
    from ..runtime import driver

    resident = _resident(kernel, x, args, constexprs, num_warps, options=options)
    return max(1, min(items, driver.device_properties(x.device.index or 0).sm_count * resident))


def persistent_cluster_grid(kernel, x, items: int, args: tuple, constexprs: dict, num_warps: int,
                            cluster: int) -> int:
    """CTAs to launch for a persistent kernel whose CTAs run in clusters of
    `cluster` along x (launched with cluster=(cluster, 1, 1)), `cluster` items per cluster:
    as many clusters as the device holds at once (a cluster's CTAs share a GPC, so that
    can be fewer than SMs / cluster; one more would wait for another to finish), but no
    more than there are items for. On the emulator, one cluster."""
    if not (is_torch(x) and x.is_cuda):
        return cluster
    return cluster * max(1, min(items // cluster, _resident(kernel, x, args, constexprs, num_warps, cluster)))


def _resident(kernel, x, args: tuple, constexprs: dict, num_warps: int, cluster: int | None = None,
              options: dict | None = None) -> int:
    """The driver's occupancy answer for this kernel variant on x's device, asked once:
    CTAs per SM, or with `cluster`, clusters of that many CTAs on the whole device."""
    options = options or {}
    key = (kernel, str(x.dtype), tuple(sorted(constexprs.items())), num_warps, x.device.index or 0, cluster,
           tuple(sorted(options.items())))
    resident = _RESIDENT.get(key)
    if resident is None:
        if cluster is None:
            resident = kernel.resident_ctas(*args, **constexprs, num_warps=num_warps, **options)
        else:
            resident = kernel.resident_clusters(*args, **constexprs, num_warps=num_warps, cluster=(cluster, 1, 1))
        _RESIDENT[key] = resident
    return resident
