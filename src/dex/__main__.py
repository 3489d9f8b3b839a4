from dex.cli.main import main

main()
