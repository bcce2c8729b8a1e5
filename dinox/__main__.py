from dinox.cli import main

main(prog_name="dinox")
