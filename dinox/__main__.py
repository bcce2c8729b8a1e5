from dinox.cli.main import entry

entry()
