from concise_attention.training.configs import main

main()
