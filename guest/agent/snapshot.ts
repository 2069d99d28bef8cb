/**
 * The entry of the agent's V8 start-up snapshot (scripts/build-agent.mjs --snapshot-blob): bundled
 * as one CommonJS script and run once at build time by `node --build-snapshot`, which keeps the
 * heap after every module of the agent has been evaluated (protobufjs descriptors, pino, the
 * services' classes). The guest's node then starts from that heap (`node --snapshot-blob`, see
 * guest/init) and only runs startAgent: nothing of the bundle is parsed, compiled or evaluated in
 * the guest.
 *
 * Nothing here may open a file, socket or timer while the snapshot is built: handles do not
 * survive into it. Run without a snapshot (plain node) it starts the agent at once.
 */
import { startupSnapshot } from 'node:v8';
import { type AgentCodeSource, startAgent } from './main.js';

/** The build's check that the blob loads (scripts/build-agent.mjs): answer and exit. */
function main(source: AgentCodeSource): void {
  if (process.env.KATA_TS_AGENT_SNAPSHOT_CHECK === '1') {
    process.stdout.write('kata-ts-agent snapshot ok\n');
    return;
  }
  startAgent(process.env, source);
}

if (startupSnapshot.isBuildingSnapshot()) startupSnapshot.setDeserializeMainFunction(() => main('snapshot'));
else main('bundle');
