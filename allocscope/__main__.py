from allocscope.cli.entry import main

main()
