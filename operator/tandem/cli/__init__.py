"""The `tandem` command line: validate, crd, run. Entry point `tandem.cli.main:app`."""
