"""vLLM's console: its level is a checked engine setting; the notices evolrl expects are dropped by message, its
other warnings and its errors still reach the user."""

from __future__ import annotations

import gc
import logging
import warnings

import pytest
import yaml
from helpers import build_config

from evolrl.cli import main
from evolrl.rollout import VLLMEngine
from evolrl.rollout.vllm_logs import QUIET, DropNotices, quiet_vllm_notices
from evolrl.settings import SettingError


def test_only_the_named_notices_are_dropped(caplog):
    quiet_vllm_notices()
    quiet_vllm_notices()  # idempotent: one filter per logger
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    assert len(layerwise.filters) == 1
    with caplog.at_level(logging.DEBUG):
        layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")  # the rotary cos/sin buffer: dropped
        layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real layer: kept
        logging.getLogger("vllm.v1.worker.cpu_worker").warning(
            "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.")
        logging.getLogger("vllm.v1.worker.cpu_worker").warning("Speculative decoding on CPU ...")
        logging.getLogger("vllm.renderers.base").error("Chat template warmup failed")  # an error: never dropped
        logging.getLogger("vllm.model_executor.model_loader.reload.inplace").info(
            "Reloading and processing weights took %.2f seconds", 0.31)
        pool = logging.getLogger("vllm.v1.core.block_pool")
        pool.info("Successfully reset prefix cache")
        pool.warning("Failed to reset prefix cache because some blocks (%d) are not freed yet", 3)  # kept
        executor = logging.getLogger("vllm.v1.executor.abstract")
        executor.info("It took %.6f seconds to fall asleep.", 0.02)  # every sampling call with sleep_level
        executor.warning("Executor is already sleeping.")  # kept
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["QKVParallelLinear: Failed to load weights", "Speculative decoding on CPU ...",
                        "Chat template warmup failed",
                        "Failed to reset prefix cache because some blocks (3) are not freed yet",
                        "Executor is already sleeping."]
    assert set(QUIET) == {"vllm.model_executor.model_loader.reload.layerwise", "vllm.v1.worker.cpu_worker",
                          "vllm.renderers.base", "vllm.model_executor.model_loader.reload.inplace",
                          "vllm.v1.core.block_pool", "vllm.v1.executor.abstract", "vllm.v1.worker.gpu_worker",
                          "vllm.device_allocator.cumem", "vllm.engine.arg_utils", "vllm.config.vllm",
                          "vllm.triton_utils.importing", "vllm.platforms.cpu"}


def test_start_up_notices_evolrl_causes_are_dropped_and_actionable_ones_kept(caplog):
    quiet_vllm_notices()
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("vllm.engine.arg_utils").warning(
            "The global random seed is set to %d. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, ...", 0)
        logging.getLogger("vllm.config.vllm").warning("Enforce eager set, disabling torch.compile, CUDAGraphs, ...")
        logging.getLogger("vllm.platforms.cpu").warning("Triton is not installed. triton-cpu is expected on x86 CPUs.")
        logging.getLogger("vllm.renderers.base").warning("Using None for EOS token id because tokenizer is not ...")
        for library in ("libtcmalloc", "libiomp"):
            logging.getLogger("vllm.v1.worker.cpu_worker").warning("%s is not found in LD_PRELOAD. ...", library)
        logging.getLogger("vllm.config.vllm").warning("max_num_batched_tokens is smaller than max_model_len")
    assert [r.getMessage() for r in caplog.records] == ["max_num_batched_tokens is smaller than max_model_len"]


def test_vllms_own_deprecation_warning_is_dropped_and_only_from_vllm():
    message = "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_vllm_notices()
        warnings.warn_explicit(message, FutureWarning, "dispatcher.py", 138, module="vllm.triton_utils.dispatcher")
        warnings.warn_explicit(message, FutureWarning, "mine.py", 1, module="mine")
    assert [w.filename for w in caught] == ["mine.py"]


def test_debug_drops_nothing():
    loggers = [logging.getLogger(name) for name in QUIET]
    kept = {logger.name: list(logger.filters) for logger in loggers}
    for logger in loggers:
        logger.filters = [f for f in logger.filters if not isinstance(f, DropNotices)]
    try:
        quiet_vllm_notices("debug")
        assert not any(isinstance(f, DropNotices) for logger in loggers for f in logger.filters)
    finally:
        for logger in loggers:
            logger.filters = kept[logger.name]


def test_a_bad_log_level_names_the_key():
    with pytest.raises(SettingError, match="VLLMEngine.log_level='loud' is not allowed: one of 'debug', 'info', "
                                           "'warning', 'error'"):
        VLLMEngine(log_level="loud")


def test_a_bad_log_level_stops_the_cli_before_any_model_loads(tmp_path, tiny_model, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["evolrl"])
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump({"data": {"engine": {"class_path": "evolrl.rollout.VLLMEngine",
                                                        "init_args": {"log_level": "INFO"}}}}))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(build_config(tmp_path, tiny_model)), "--config", str(path)])
    assert exit_info.value.code == 2
    assert "VLLMEngine.log_level='INFO' is not allowed: one of 'debug', 'info', 'warning', 'error'" in (
        capsys.readouterr().err)


@pytest.mark.vllm
def test_a_real_start_prints_no_info_lines_and_no_dropped_notice(tiny_model, capfd):
    pytest.importorskip("vllm")
    from evolrl.models import load_policy, load_tokenizer

    engine = VLLMEngine(dtype="float32", enforce_eager=True, kv_cache_gib=0.1, max_model_len=64)
    engine.setup(load_tokenizer(tiny_model))
    capfd.readouterr()
    engine.load_weights(load_policy(tiny_model))
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert not [line for line in lines if " INFO " in line], lines
    dropped = [start for starts in QUIET.values() for start in starts]
    assert not [line for line in lines if any(start in line for start in dropped)], lines
    del engine
    gc.collect()
