from fedmask.cli import main

main()
