"""A backend module whose optional dependency is not installed (for the registry tests)."""

import lrft_package_that_does_not_exist  # type: ignore[import-not-found]  # missing on purpose

Backend = lrft_package_that_does_not_exist.Backend
