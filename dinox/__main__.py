from dinox.cli.entry import entry

entry()
