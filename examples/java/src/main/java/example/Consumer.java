// A RabbitMQ consumer of payment messages that pays each order once, however often it is delivered.
//
// Each message is {"order_id": "...", "amount": ...} with its idempotency key as the AMQP message id.
// PostgreSQL from JDBC_URL, the broker from AMQP_URL, the queue from QUEUE. Built offline from
// Debian's libpostgresql-jdbc-java and librabbitmq-client-java (tests/readme_snippets.sh), or with
// pom.xml. The part between the README markers is the Java snippet of README.md.
package example;

import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DeliverCallback;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class Consumer {
  record Payment(String orderId, BigDecimal amount) {
    private static final Pattern FIELDS =
        Pattern.compile("\"order_id\"\\s*:\\s*\"([^\"]*)\".*\"amount\"\\s*:\\s*([0-9.eE+-]+)", Pattern.DOTALL);

    // The two fields of the flat message, without a JSON library; a real consumer uses its own.
    static Payment parse(byte[] body) {
      Matcher m = FIELDS.matcher(new String(body, StandardCharsets.UTF_8));
      if (!m.find()) throw new IllegalArgumentException("not a payment message");
      return new Payment(m.group(1), new BigDecimal(m.group(2)));
    }
  }

  public static void main(String[] args) throws Exception {
    Connection conn = DriverManager.getConnection(
        Objects.requireNonNullElse(System.getenv("JDBC_URL"), "jdbc:postgresql:///postgres"));
    var factory = new ConnectionFactory();
    factory.setUri(Objects.requireNonNullElse(System.getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672"));
    Channel channel = factory.newConnection().createChannel();
    String queue = Objects.requireNonNullElse(System.getenv("QUEUE"), "payments");
    channel.queueDeclare(queue, true, false, false, null);
    channel.basicQos(10);
    channel.basicConsume(queue, false, onMessage(conn, killBeforeAck(channel)), tag -> {});
  }

  // make e2e's crash between COMMIT and ack: with E2E_KILL_AT_ACK=N the process SIGKILLs itself in
  // place of its N-th ack, after that message's transaction committed. Unset, the channel is as is.
  static Channel killBeforeAck(Channel channel) {
    String at = System.getenv("E2E_KILL_AT_ACK");
    if (at == null || at.isEmpty()) return channel;
    int n = Integer.parseInt(at);
    var acks = new AtomicInteger();
    InvocationHandler handler = (proxy, method, args) -> {
      if (method.getName().equals("basicAck") && acks.incrementAndGet() == n) {
        System.err.println("e2e: SIGKILL in place of ack " + n + ", after its COMMIT");
        new ProcessBuilder("kill", "-KILL", Long.toString(ProcessHandle.current().pid())).start().waitFor();
      }
      try {
        return method.invoke(channel, args);
      } catch (InvocationTargetException e) {
        throw e.getCause();
      }
    };
    return (Channel) Proxy.newProxyInstance(Channel.class.getClassLoader(), new Class<?>[] {Channel.class}, handler);
  }

  static DeliverCallback onMessage(Connection conn, Channel channel) {
    // README:begin java
    // One connection is enough: the client hands over one channel's deliveries one at a time.
    return (consumerTag, delivery) -> {
      long tag = delivery.getEnvelope().getDeliveryTag();
      String key = delivery.getProperties().getMessageId();
      try {
        Payment p = Payment.parse(delivery.getBody());
        conn.setAutoCommit(false); // the claim and the payment are one transaction, ended by commit()
        try {
          boolean isNew;
          try (var st = conn.prepareStatement("SELECT idem_claim(?, 'billing')")) {
            st.setString(1, key);
            try (var rs = st.executeQuery()) { rs.next(); isNew = rs.getBoolean(1); }
          }
          if (isNew) {
            try (var st = conn.prepareStatement("INSERT INTO payments (order_id, amount) VALUES (?, ?)")) {
              st.setString(1, p.orderId());
              st.setBigDecimal(2, p.amount());
              st.executeUpdate();
            }
          }
          conn.commit();
        } catch (SQLException | RuntimeException e) {
          conn.rollback();
          throw e;
        }
      } catch (SQLException | RuntimeException e) {
        System.err.println("payment " + key + " rolled back, requeued: " + e);
        channel.basicNack(tag, false, true); // requeue: the broker delivers it again
        if (e instanceof SQLException s && s.getSQLState() != null && s.getSQLState().startsWith("08")) {
          System.exit(1); // the server is gone (a restart, a failover): a supervisor restarts us
        }
        return;
      }
      channel.basicAck(tag, false); // only after COMMIT; a duplicate is acked too
    };
    // README:end java
  }
}
