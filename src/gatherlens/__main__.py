from gatherlens.cli import main

main()
