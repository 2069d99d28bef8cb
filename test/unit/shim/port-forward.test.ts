import { describe, expect, it } from 'vitest';
import { PORT_FORWARD_RULE_COMMENT, parseListenPort, planPortForwardRule, planStaleRuleRemoval } from '../../../src/shim/port-forward.js';

describe("containerd's port-forward door: the rule and the helper's port", () => {
  it('redirects tcp to 127.0.0.1 on lo, except to the listener itself, to the listener; -D is the same rule', () => {
    const add = planPortForwardRule('-A', 40123);
    expect(add.join(' ')).toBe(
      `-w -t nat -A OUTPUT -o lo -p tcp -d 127.0.0.1/32 ! --dport 40123 -m comment --comment ${PORT_FORWARD_RULE_COMMENT} -j REDIRECT --to-ports 40123`,
    );
    const del = planPortForwardRule('-D', 40123);
    expect(del.filter((a) => a !== '-D')).toEqual(add.filter((a) => a !== '-A'));
  });

  it("takes only a TCP port from the helper's first line", () => {
    expect(parseListenPort('40123')).toBe(40123);
    for (const bad of ['', '0', '65536', '-1', '12a', ' 80', '123456', '8.0']) expect(parseListenPort(bad)).toBeNull();
  });
});

describe("containerd's port-forward door: rules a dead shim left", () => {
  it('removes only rules carrying our comment, each as it was listed', () => {
    const listing = [
      '-P OUTPUT ACCEPT',
      `-A OUTPUT -d 127.0.0.1/32 -o lo -p tcp -m tcp ! --dport 4000 -m comment --comment ${PORT_FORWARD_RULE_COMMENT} -j REDIRECT --to-ports 4000`,
      '-A OUTPUT -d 127.0.0.1/32 -p tcp -m comment --comment someone-else -j REDIRECT --to-ports 5000',
      '-A OUTPUT -p tcp -j ACCEPT',
      '',
    ].join('\n');
    expect(planStaleRuleRemoval(listing)).toEqual([
      [
        '-w',
        '-t',
        'nat',
        '-D',
        'OUTPUT',
        '-d',
        '127.0.0.1/32',
        '-o',
        'lo',
        '-p',
        'tcp',
        '-m',
        'tcp',
        '!',
        '--dport',
        '4000',
        '-m',
        'comment',
        '--comment',
        PORT_FORWARD_RULE_COMMENT,
        '-j',
        'REDIRECT',
        '--to-ports',
        '4000',
      ],
    ]);
    expect(planStaleRuleRemoval('-P OUTPUT ACCEPT\n')).toEqual([]);
  });
});
