from dinox.cli import entry

entry()
