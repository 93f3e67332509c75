"""Maps the import package `spate` onto src/ (every package below src/ becomes spate.<name>),
and `pyspark_spate` (Spark's auto-registration of format `spate`) onto src/spark/pyspark_spate."""

from setuptools import find_packages, setup

setup(
    packages=["spate", "pyspark_spate"]
    + [f"spate.{name}" for name in find_packages("src", exclude=["spark.pyspark_spate"])],
    package_data={"spate": ["py.typed"], "spate.gateway": ["_fastsend*.so"]},  # ADR 0030
)
