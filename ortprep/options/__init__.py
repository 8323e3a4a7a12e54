"""Step options as data, in one place: :mod:`ortprep.options.fields` is the machinery (field kinds,
parsing from the command line and from TOML, writing a config back), :mod:`ortprep.options.groups`
the options several commands share (declared once), :mod:`ortprep.options.steps` the Options
dataclass of every step. All are light (no onnx, numpy or ONNX Runtime import), so the
command line and ``--help`` never pay for them, and any layer may read a step's options."""

from ortprep.options.fields import (  # noqa: F401 - the public names of the machinery
    Kind,
    OptionSpec,
    StepOptions,
    cli_flags,
    config_value,
    convert_value,
    default_of,
    off_flag,
    option,
    relative_path,
    spec_of,
)
from ortprep.options.steps import *  # noqa: F401,F403 - every step's Options
from ortprep.options.steps import (  # noqa: F401 - constants other modules read
    COMPILE_EPS,
    DEFAULT_MIN_COSINE,
    DEFAULT_TIMEOUT,
    LEVELS,
    MAX_ROUNDS,
    MODES,
)
