// Starts the local SQS-compatible server (fauxqs) on the loopback interface only.
// Usage: node server.mjs [port]   (port 0 picks a free one; the chosen port is printed
// as "LISTENING <port>" on stdout so a parent process can read it).
import { buildApp } from "fauxqs";

const port = Number(process.argv[2] ?? process.env.LOCAL_SQS_PORT ?? 9324);
const app = buildApp({ logger: false });
await app.listen({ host: "127.0.0.1", port });
const { port: bound } = app.server.address();
process.stdout.write(`LISTENING ${bound}\n`);

const stop = async () => {
  await app.close();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
