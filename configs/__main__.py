from configs import main

main()
