"""What the tests share that is not a test or a fixture: fakes, harnesses, sample inputs, task files and
constants, one folder per room as under tests/. Tests import them as `helpers.<room>.<module>` (tests/ is on
sys.path: pytest puts the folder of the rootmost conftest.py there); fixtures stay in the conftest.py files.
Some modules here are also run or loaded by path, as a script or as a user's task file."""
