__version__ = "0.1.0"

#: The name memest is published under on the package registry (``memest`` there is another
#: project's). The import package and the command stay ``memest``.
DISTRIBUTION = "vllm-memest"


def _extra_requirements(extra: str) -> list[str]:
    """The requirements the installed distribution declares for ``extra``, markers dropped."""
    import importlib.metadata as md

    try:
        declared = md.requires(DISTRIBUTION) or []
    except md.PackageNotFoundError:
        return []
    out = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        if marker.replace("'", '"').replace(" ", "") == f'extra=="{extra}"':
            out.append(requirement.strip())
    return out


def install_hint(extra: str) -> str:
    """The pip command that installs one of memest's extras into this environment.

    It names the extra's own requirements (matplotlib>=3.8 for plots), which install however
    memest itself was installed (a built wheel, a checkout, the registry); from a source tree
    with no installed metadata, the checkout's extra.
    """
    requirements = _extra_requirements(extra)
    if not requirements:
        return f"pip install -e '.[{extra}]'"
    return " ".join(["pip", "install", *(f"'{r}'" for r in requirements)])
