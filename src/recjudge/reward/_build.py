"""Build a judge from the options a command line gives (``recjudge judge``, ``impute``,
``augment`` call it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recjudge.cf_models import item_item_for, load_model, trained_on
from recjudge.data import load_dataset
from recjudge.llm import LLMConfig, SamplingConfig, load_llm
from recjudge.reward._judge import Judge
from recjudge.reward._judge_config import JUDGES, JudgeConfig
from recjudge.reward._modes import SIMULATOR_MODES
from recjudge.reward._simulators import Population

if TYPE_CHECKING:
    from recjudge.reward._judge import Judge, JudgeExecutor


def build_judge(
    model: str,
    mode: str,
    cf: str | None,
    beta: float,
    need_evidence: bool = True,
    sample: int = 0,
    seed: int = 0,
    batch_size: int | None = None,
    max_evidence: int = 5,
    backend: str = "transformers",
    server: str | None = None,
    max_history: int = 50,
    dataset: Any = None,
    device: str = "auto",
    executor: JudgeExecutor | None = None,
    layout: str = "candidate-last",
    marking: str = "plain",
) -> Judge:
    """A judge from command-line style options: which backend serves the model (in
    process on ``device``, vLLM, or an OpenAI-compatible ``server``), the CF model saved at
    ``cf`` (wrapped as the calibrated item-item signal for ``mode="item-item"``), and the
    simulators' population from ``dataset``. ``executor``: where the judge's calls run
    (``distributed.ray_executor`` for ``--ray``; None: in this process); ``layout`` and
    ``marking``: ``JudgeConfig``'s defences against item text. Raises ValueError
    for a mode that needs a CF model without one, pydantic's ValidationError for a bad
    device."""
    JUDGES.get(mode)
    sampling = SamplingConfig.paper(seed=seed) if sample else SamplingConfig(max_new_tokens=256)
    config = JudgeConfig(
        model=model,
        mode=mode,
        beta=beta,
        need_evidence=need_evidence,
        sampling=sampling,
        samples=max(sample, 1),
        batch_size=batch_size,
        max_evidence=max_evidence,
        max_history=max_history,
        layout=layout,
        marking=marking,
    )
    llm = None
    on_workers = {"backend": backend} if executor is not None and backend == "vllm" else {}
    if (backend != "transformers" or server) and not on_workers:
        if server and backend == "transformers":
            backend = "openai-compatible"
        llm = load_llm(LLMConfig(model=model, backend=backend, base_url=server))
    # In process: loaded when first needed, on this device (auto: CUDA when there is one).
    # ("auto" is left unset, so the command line's root --device, if any, applies). With
    # --ray --backend vllm, each worker loads vLLM from this config (the driver never does).
    placed = {"device": device} if device != "auto" else {}
    llm_config = None if llm is not None else LLMConfig(model=model, **placed, **on_workers)
    cf_model = _cf_model(cf, mode, seed)
    if config.uses_cf() and cf_model is None:
        raise ValueError(
            f"mode {mode!r} needs --cf DIR (a model from `recjudge cf train`), or "
            "use --mode no-behavior / zero-shot"
        )
    population = None
    if config.mode in SIMULATOR_MODES and dataset is not None:
        population = Population.of(dataset)  # the user simulators' traits and attributes
    return Judge(config, llm=llm, cf=cf_model, population=population, llm_config=llm_config,
                 executor=executor)  # fmt: skip


def _cf_model(cf: str | None, mode: str, seed: int) -> Any:
    """The CF model saved at ``cf`` (None without one); for ``item-item``, a SASRec or MF
    model becomes the calibrated item-item signal of the dataset it was trained on. (A
    judge without a CF model never imports the CF models' modules.)"""
    if not cf:
        return None

    cf_model = load_model(cf)
    if mode == "item-item" and cf_model.name != "item-item":
        dataset = trained_on(cf_model)
        cf_model = item_item_for(cf_model, load_dataset(dataset), seed=seed)
    return cf_model
