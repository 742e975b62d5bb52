"""Shared test configuration: hypothesis profiles, the gpu marker and a temporary kernel
cache for the whole run."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "deep", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def _temporary_kernel_cache(tmp_path_factory):
    """One WEFT_CACHE_DIR for the run, under pytest's temporary folder: kernels compiled by
    one test serve later ones (and subprocesses, which inherit it), and the user's
    ~/.cache/weft stays untouched. Tests that need an empty cache set their own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WEFT_CACHE_DIR", str(tmp_path_factory.mktemp("weft-cache")))
        yield


def _gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
