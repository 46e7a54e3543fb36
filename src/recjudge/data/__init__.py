"""Datasets in one interaction schema, loaders from installed packages, splits, rendering."""

from recjudge.data._loaders import (
    GISTBENCH_COLUMNS,
    LOADERS,
    bookcrossing_event,
    bookcrossing_wheel,
    export_gistbench,
    export_tables,
    load_dataset,
    load_from_files,
    movielens_event,
    parse_mapping,
    read_table,
)
from recjudge.data._render import clean_text, item_title, render_item
from recjudge.data._schema import (
    EVENT_TYPES,
    INTERACTION_COLUMNS,
    POSITIVE_EVENTS,
    DataError,
    Dataset,
    validate_interactions,
)
from recjudge.data._splits import (
    Split,
    kcore,
    leave_one_out,
    sample_users,
    split_dataset,
    split_past_future,
    temporal_split,
    timeline_split,
    user_order_key,
)
from recjudge.data._titles import TitleScreen

__all__ = [
    "EVENT_TYPES",
    "GISTBENCH_COLUMNS",
    "INTERACTION_COLUMNS",
    "LOADERS",
    "POSITIVE_EVENTS",
    "DataError",
    "Dataset",
    "Split",
    "TitleScreen",
    "bookcrossing_event",
    "clean_text",
    "export_gistbench",
    "export_tables",
    "item_title",
    "kcore",
    "leave_one_out",
    "load_dataset",
    "load_from_files",
    "read_table",
    "movielens_event",
    "bookcrossing_wheel",
    "parse_mapping",
    "render_item",
    "sample_users",
    "split_dataset",
    "split_past_future",
    "temporal_split",
    "timeline_split",
    "user_order_key",
    "validate_interactions",
]
