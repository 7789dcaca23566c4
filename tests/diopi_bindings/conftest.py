"""The DIOPI tests' fixtures; they and the helpers live in diopi_testlib (a module name no other test
folder uses, so the helpers import the same way however pytest orders the folders)."""
from diopi_testlib import partial_path, reference_path, reference_variants, variant_path  # noqa: F401 (fixtures)
