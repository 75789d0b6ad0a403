"""Testing helpers shared by the test-suite, ``tessera check`` and ``tessera bench``."""
