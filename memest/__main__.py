from memest.cli import entry

entry()
