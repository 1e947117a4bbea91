from allocscope.entry import main

main()
