from freeinference_batch_client.cli import main

main()
