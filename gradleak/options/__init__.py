"""Option specs and the limits on run values: `parsing` turns `NAME[:key=value,...]` specs into
typed option dataclasses, `limits` holds the bounds, size limits, device and path checks that
run values are kept within. Every public name of both is re-exported here.
"""
from __future__ import annotations

from .limits import (
    MAX_ACTIVATIONS,
    MAX_BATCH,
    MAX_CLASSES,
    MAX_COUNT,
    MAX_DATA_BYTES,
    MAX_DOUBLINGS,
    MAX_IMAGE_SIDE,
    MAX_IMAGES,
    MAX_ITERATIONS,
    MAX_LOCAL_EPOCHS,
    MAX_LR,
    MAX_MAGNITUDE,
    MAX_NAME_CHARS,
    MAX_PARAMETERS,
    MAX_PATH_CHARS,
    MAX_SEED,
    MAX_SWEEP_CELLS,
    MAX_WORKERS,
    MIN_IMAGE_SIDE,
    NAME_RANGES,
    RUN_SPEC_BOUNDS,
    check_device,
    check_output_path,
    check_range,
    check_size,
    device_name,
    human_bytes,
    output_dir,
    output_file,
    path_kind,
    ranged,
)
from .parsing import (
    ComponentSpec,
    build_options,
    check,
    field_range,
    options_dict,
    parse_chain,
    parse_pairs,
    parse_spec,
)

__all__ = [
    "MAX_COUNT", "MAX_MAGNITUDE", "MAX_ITERATIONS", "MAX_SEED", "MAX_WORKERS", "MAX_SWEEP_CELLS", "MAX_BATCH",
    "MAX_IMAGES", "MAX_LR", "MAX_LOCAL_EPOCHS", "NAME_RANGES", "field_range", "check_range", "ranged",
    "ComponentSpec", "parse_chain", "parse_pairs", "parse_spec", "build_options", "check", "options_dict",
    "MAX_PARAMETERS",
    "MAX_ACTIVATIONS", "MAX_DATA_BYTES", "MIN_IMAGE_SIDE", "MAX_IMAGE_SIDE", "MAX_DOUBLINGS",
    "RUN_SPEC_BOUNDS", "MAX_CLASSES", "human_bytes", "check_size", "check_device", "device_name", "path_kind",
    "MAX_PATH_CHARS", "MAX_NAME_CHARS", "check_output_path", "output_dir", "output_file",
]
