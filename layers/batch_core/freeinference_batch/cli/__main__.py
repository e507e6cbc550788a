from freeinference_batch.cli import main

main()
