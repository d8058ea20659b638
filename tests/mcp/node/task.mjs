// A held call as an MCP task (protocol 2025-11-25), with the official TypeScript SDK's
// experimental tasks client. Prints {"taskCreated": task} as soon as the task exists (the
// pytest decides the approval then), and {"messages": [...]} once the stream ends.
// Usage: node task.mjs <base url> <api key> <tool id>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [base, key, toolId] = process.argv.slice(2);
const client = new Client({ name: "toolhub-node-task-test", version: "1.0.0" });
await client.connect(
  new StreamableHTTPClientTransport(new URL("/mcp/", base), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  }),
);
await client.listTools();

const messages = [];
const stream = client.experimental.tasks.callToolStream(
  { name: toolId, arguments: {} },
  undefined,
  { task: { ttl: 600000 }, timeout: 120000 },
);
for await (const message of stream) {
  if (message.type === "taskCreated") {
    process.stdout.write(JSON.stringify({ taskCreated: message.task }) + "\n");
  }
  if (message.type === "error") {
    messages.push({ type: "error", message: String(message.error?.message ?? message.error) });
  } else {
    messages.push(message);
  }
}
await client.close();
process.stdout.write(JSON.stringify({ messages }) + "\n");
