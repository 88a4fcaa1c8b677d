from concise_attention.training.run.configs import main

main()
