from allocscope.cli import main

main()
