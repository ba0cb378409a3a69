"""What the GPU modules of the CUDA layer share."""
import pytest


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """A fresh spartune cache directory (cubins, tuning DB) for one module and the processes it
    starts; the CUDA layer's in-process cache forgets the old one."""
    from spartune.kernels.cuda import runtime

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARTUNE_CACHE_DIR", str(tmp_path_factory.mktemp("spartune-cache")))
        runtime.set_cache(None)
        yield
    runtime.set_cache(None)
