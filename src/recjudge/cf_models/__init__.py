"""CF models (SASRec, ALS, BPR, ItemKNN, Pop, item-item) and the behavioural signal sigma."""

from recjudge.cf_models._base import (
    MODELS,
    CFModel,
    SignalConfig,
    SignalScaler,
    TrainOptions,
    load_model,
)
from recjudge.cf_models._classic import (
    ALS,
    BPR,
    ItemItemConfig,
    ItemItemSimilarity,
    ItemKNN,
    KNNConfig,
    MFConfig,
    Pop,
    interaction_matrix,
)
from recjudge.cf_models._eval import (
    cached_cf,
    calibration_pairs,
    eval_saved,
    evaluate_full,
    evaluate_sampled,
    hit_ndcg,
    item_item_for,
    rank_of_target,
    recommend_saved,
    train_cf,
)
from recjudge.cf_models._sasrec import SASRec, SASRecConfig

__all__ = [
    "ALS",
    "BPR",
    "MODELS",
    "SASRec",
    "SASRecConfig",
    "CFModel",
    "ItemItemConfig",
    "ItemItemSimilarity",
    "ItemKNN",
    "KNNConfig",
    "MFConfig",
    "Pop",
    "SignalConfig",
    "SignalScaler",
    "TrainOptions",
    "calibration_pairs",
    "eval_saved",
    "evaluate_full",
    "evaluate_sampled",
    "hit_ndcg",
    "cached_cf",
    "interaction_matrix",
    "item_item_for",
    "load_model",
    "rank_of_target",
    "recommend_saved",
    "train_cf",
]
