"""pyproject.toml's build backend: meson-python, with slotrpc's setup
options.  meson-python 0.12 (Debian 12) reads no meson arguments from
pyproject.toml, and the project's defaults build the test suite, the
examples and the benchmarks, which a Python install does not need; this
adds -Dpython=enabled -Dtests=false -Dexamples=false -Dbench=false ahead of
any -Csetup-args the caller passes."""

import mesonpy

_SETUP = ["-Dpython=enabled", "-Dtests=false", "-Dexamples=false", "-Dbench=false",
          "-Dunity_library=true", "-Drxe_suite=false"]


def _settings(config_settings):
    settings = dict(config_settings or {})
    extra = settings.get("setup-args", [])
    if isinstance(extra, str):
        extra = [extra]
    settings["setup-args"] = _SETUP + list(extra)
    return settings


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return mesonpy.build_wheel(wheel_directory, _settings(config_settings), metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return mesonpy.build_sdist(sdist_directory, _settings(config_settings))


def get_requires_for_build_wheel(config_settings=None):
    return mesonpy.get_requires_for_build_wheel(_settings(config_settings))


def get_requires_for_build_sdist(config_settings=None):
    return mesonpy.get_requires_for_build_sdist(_settings(config_settings))


if hasattr(mesonpy, "prepare_metadata_for_build_wheel"):
    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        return mesonpy.prepare_metadata_for_build_wheel(metadata_directory, _settings(config_settings))
