"""Maps the import package `spate` onto src/ (every package below src/ becomes spate.<name>)."""

from setuptools import find_packages, setup

setup(
    packages=["spate"] + [f"spate.{name}" for name in find_packages("src")],
    package_data={"spate": ["py.typed"]},
)
