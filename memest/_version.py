__version__ = "0.1.0"

#: The name memest is published under on the package registry (``memest`` there is another
#: project's). The import package and the command stay ``memest``.
DISTRIBUTION = "vllm-memest"


def install_hint(extra: str) -> str:
    """The pip command that installs one of memest's extras, e.g. ``pip install 'vllm-memest[plots]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"
