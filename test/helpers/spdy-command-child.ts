// Runs one exec over SPDY (as client-go's remotecommand executor does) in its own process, so a
// test can run it inside another network namespace (`nsenter --net`): containerd's streaming
// server listens on a loopback address that only its own namespace reaches.
// argv: <url> <options as JSON (CommandOptions, stdin as a string)>; prints the result as JSON.
import { type CommandOptions, spdyCommand } from './streaming-client.js';

const [url, optionsJson] = process.argv.slice(2);
if (url === undefined || optionsJson === undefined) {
  process.stderr.write('usage: spdy-command-child <url> <options json>\n');
  process.exit(2);
}
const raw = JSON.parse(optionsJson) as Omit<CommandOptions, 'stdin'> & { stdin?: string };
const { stdin, ...rest } = raw;
const options: CommandOptions = { ...rest, ...(stdin === undefined ? {} : { stdin: Buffer.from(stdin) }) };
const result = await spdyCommand(url, options);
process.stdout.write(
  JSON.stringify({ protocol: result.protocol, stdout: result.stdout.toString(), stderr: result.stderr.toString(), status: result.status }),
);
